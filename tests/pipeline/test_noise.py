"""Third-party chatter stays off a default run and comes back with ``-v``: a transformers BERT through the CLI (a
library's warning raised while the export traces it, TensorRT-RTX's parser advice on int64 inputs), and onnxscript's
optimizer logger."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from pipeline.noise import THIRD_PARTY_LOGGER, quiet_third_party, show_third_party, third_party_shown

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("transformers")

BERT = textwrap.dedent(
    f"""
    import sys
    sys.path.append({str(ROOT / "tests")!r})
    import tests_environment  # torchvision's operator schemas: transformers' BertModel imports torchvision
    import warnings
    import torch, transformers
    from model_zoo import bert_inputs, tiny_bert_config

    class Warned(torch.nn.Module):  # a library deprecation raised while the export traces the model
        def __init__(self):
            super().__init__()
            self.bert = transformers.BertModel(tiny_bert_config())

        def forward(self, **inputs):
            if torch.compiler.is_exporting():  # the export's chatter; the model's own eager run stays as it is
                warnings.warn("`old_argument` is deprecated inside the library", FutureWarning)
            return self.bert(**inputs)

    def build():
        torch.manual_seed(0)
        return Warned().eval(), ((), bert_inputs(2, 16, seed=0))
    """
)


def convert(tmp_path: Path, *extra: str) -> str:
    (tmp_path / "bert.py").write_text(BERT)
    out = tmp_path / ("out" + "".join(extra))
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "convert", f"{tmp_path / 'bert.py'}:build", "-o", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_default_bert_conversion_prints_our_lines_only_and_v_shows_the_rest(tmp_path: Path) -> None:
    quiet = convert(tmp_path)
    assert all(line.startswith("  ") for line in quiet.splitlines()), quiet  # the CLI's stage lines
    assert "TensorRT-RTX:" not in quiet and "warning:" not in quiet and "Evaluation failed" not in quiet
    assert "  validate done" in quiet
    verbose = convert(tmp_path, "-v")
    assert "Make sure input input_ids has Int64 binding" in verbose  # TensorRT-RTX's parser, at -v
    assert "warning: `old_argument` is deprecated" in verbose  # warnings raised while exporting, at -v


def test_onnxscript_and_exporter_messages_are_held_back_unless_asked(caplog: pytest.LogCaptureFixture) -> None:
    folding = logging.getLogger("onnxscript.optimizer._constant_folding")  # where "Evaluation failed" comes from
    assert not third_party_shown()
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_third_party():
            folding.warning("Evaluation failed: %s", "cannot reshape array of size 4 into shape (2,3)")
            logging.getLogger("torch.onnx").warning("torchvision is not installed")
            warnings.warn("an exporter deprecation", FutureWarning, stacklevel=1)
        warnings.warn("ours, outside the block", UserWarning, stacklevel=1)
    assert caplog.records == [] and [str(w.message) for w in caught] == ["ours, outside the block"]
    show_third_party()
    try:
        assert third_party_shown()
        with caplog.at_level(logging.WARNING), quiet_third_party():
            folding.warning("Evaluation failed: %s", "cannot reshape array of size 4 into shape (2,3)")
        assert [r.getMessage() for r in caplog.records] == [
            "Evaluation failed: cannot reshape array of size 4 into shape (2,3)"
        ]
    finally:
        show_third_party(False)
    assert logging.getLogger(THIRD_PARTY_LOGGER).level == logging.NOTSET
