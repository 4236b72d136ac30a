"""How long does TensorRT-RTX's builder take on a chain of normalisations ``x / (ReduceSum(x) + eps)``?

GLM-5 Next's and DeepSeek-V4's hyper-connections run Sinkhorn-Knopp iterations unrolled in the graph: each of the
checkpoint's 20 iterations normalises a small matrix by its column sums, then by its row sums, 39 chained divisions
by a sum per hyper-connection. On the every-type sweep's GLM-5 Next with those 20 iterations, TensorRT-RTX 1.7's
builder had not built the text step after 16 minutes (8 GB resident; the ONNX Runtime side converted and decoded as
transformers in 91 s). This probe builds that chain alone: a [batch, 1, 4, 4] float32 input (batch 1-8, dynamic),
``ReduceSum`` over alternating axes, ``Add`` eps, ``Div`` (or ``Reciprocal`` and ``Mul``: ``--reciprocal``), N times,
strongly typed, ahead of time on the CPU. Seen on 2026-12-01 (2 shared cores): 2 links 0.1 s, 4 0.42 s, 8 39.6 s,
12 not built in 300 s; with ``Reciprocal``/``Mul`` 8 links 28.6 s: about 3x per link, which no rewrite of the
division changes. Each sum computed as a MatMul with ones ends the fusion: the default passes do that to chains of 4
or more (``passes/chained_sums.py``); ``--rewritten`` builds the chain after that pass (2026-12-02: 40 links in
1.8 s).

    python benchmarks/probe_chained_normalisation.py 2 4 8        # the chain lengths to build, as exported
    python benchmarks/probe_chained_normalisation.py --reciprocal 8
    python benchmarks/probe_chained_normalisation.py --rewritten 8 12 39
"""

from __future__ import annotations

import argparse
import time

from onnx import TensorProto, helper


def chain(links: int, reciprocal: bool) -> bytes:
    """The ONNX model of ``links`` chained normalisations (see the module docstring)."""
    initializers = [
        helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-6]),
        helper.make_tensor("rows", TensorProto.INT64, [1], [-1]),
        helper.make_tensor("columns", TensorProto.INT64, [1], [-2]),
    ]
    nodes, x = [], "x"
    for i in range(links):
        nodes += [
            helper.make_node("ReduceSum", [x, "columns" if i % 2 == 0 else "rows"], [f"sum{i}"], keepdims=1),
            helper.make_node("Add", [f"sum{i}", "eps"], [f"total{i}"]),
        ]
        if reciprocal:
            nodes += [
                helper.make_node("Reciprocal", [f"total{i}"], [f"inverse{i}"]),
                helper.make_node("Mul", [x, f"inverse{i}"], [f"out{i}"]),
            ]
        else:
            nodes.append(helper.make_node("Div", [x, f"total{i}"], [f"out{i}"]))
        x = f"out{i}"
    shape = ["batch", 1, 4, 4]
    graph = helper.make_graph(
        nodes,
        "normalisations",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def rewritten(model: bytes) -> bytes:
    """``model`` after the default passes' rewrite of its sums (:class:`passes.chained_sums.ChainedSumsAsMatMul`)."""
    import sys
    from pathlib import Path

    import onnx
    import onnx_graphsurgeon as gs

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from passes.chained_sums import ChainedSumsAsMatMul
    from pipeline.settings import Settings

    graph = gs.import_onnx(onnx.shape_inference.infer_shapes(onnx.load_from_string(model)))
    result = ChainedSumsAsMatMul()(graph, Settings())
    return gs.export_onnx(result.graph).SerializeToString()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("links", type=int, nargs="+", help="chain lengths to build")
    parser.add_argument("--reciprocal", action="store_true", help="Reciprocal and Mul instead of Div")
    parser.add_argument("--rewritten", action="store_true", help="after passes.chained_sums (sums as MatMuls)")
    args = parser.parse_args()
    import tensorrt_rtx as trt

    logger = trt.Logger(trt.Logger.ERROR)
    for links in args.links:
        builder = trt.Builder(logger)
        network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        onnx_parser = trt.OnnxParser(network, logger)
        model = chain(links, args.reciprocal)
        if args.rewritten:
            model = rewritten(model)
        if not onnx_parser.parse(model):
            raise SystemExit(f"the parser refused the chain of {links}: {onnx_parser.get_error(0)}")
        config = builder.create_builder_config()
        profile = builder.create_optimization_profile()
        profile.set_shape("x", (1, 1, 4, 4), (2, 1, 4, 4), (8, 1, 4, 4))
        config.add_optimization_profile(profile)
        start = time.perf_counter()
        plan = builder.build_serialized_network(network, config)
        seconds = time.perf_counter() - start
        print(f"{links} normalisations: {seconds:.2f} s, {'built' if plan else 'NOT BUILT'}", flush=True)


if __name__ == "__main__":
    main()
