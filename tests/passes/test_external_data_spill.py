"""Large constants made by passes are written to a data file and read back exactly, in every plain numpy dtype."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from passes.model_io.external_data import ExternalValues, spill_constants


def test_spilled_constants_read_back_exactly_and_small_ones_stay_inline(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "bool": rng.random(600_000) > 0.5,
        "int8": rng.integers(-128, 127, (1000, 700), dtype=np.int8),
        "uint8": rng.integers(0, 255, 1 << 20, dtype=np.uint8),
        "int64": rng.integers(-(1 << 40), 1 << 40, (300, 400), dtype=np.int64),
        "float64": rng.random((300, 1000)),
        "float16": rng.random((1000, 600)).astype(np.float16),
        "small": np.ones(16, np.float32),
    }
    constants = [gs.Constant(name, values) for name, values in arrays.items()]
    graph = gs.Graph(nodes=[], inputs=[], outputs=constants)

    assert spill_constants(graph, tmp_path, min_bytes=1 << 18) == 6
    assert [p.name for p in tmp_path.iterdir()] == ["passes_0.data"]
    for constant in constants:
        if constant.name == "small":
            assert not isinstance(constant._values, ExternalValues)
            continue
        assert isinstance(constant._values, ExternalValues)
        location = {e.key: e.value for e in constant._values.tensor.external_data}
        assert int(location["offset"]) % 4096 == 0
        values = constant._values.load()
        assert values.dtype == arrays[constant.name].dtype
        np.testing.assert_array_equal(values, arrays[constant.name])
        tensor = onnx.TensorProto()
        tensor.CopyFrom(constant._values.tensor)
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(tensor, str(tmp_path)), arrays[constant.name])
