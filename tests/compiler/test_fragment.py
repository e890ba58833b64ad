"""Fragment encoding: the chunked wire format decodes to exactly the model a plain build gives."""

from __future__ import annotations

import hashlib

import onnx
import pytest
from onnx import helper

from edgec.compiler.emit.encode import assemble
from tests.conftest import conv_chain_model


def test_chunks_decode_to_the_plain_model():
    src = conv_chain_model(n=2)
    nodes = list(src.graph.node)
    enc = assemble(src, nodes, list(src.graph.input), list(src.graph.output), list(src.graph.initializer), "frag")
    plain = helper.make_model(helper.make_graph(nodes, "frag", list(src.graph.input), list(src.graph.output),
                                                initializer=list(src.graph.initializer)),
                              opset_imports=list(src.opset_import), producer_name="edgec")
    plain.ir_version = src.ir_version
    decoded = onnx.load_from_string(enc.data)
    assert decoded == plain
    assert enc.sha256 == hashlib.sha256(enc.data).hexdigest()
    onnx.checker.check_model(decoded, full_check=True)


def test_checker_failure_names_the_fragment():
    src = conv_chain_model(n=1)
    bad = helper.make_node("Relu", ["nowhere"], ["y"])
    with pytest.raises(RuntimeError, match="fragment broken fails onnx.checker"):
        assemble(src, [bad], [], list(src.graph.output), [], "broken")
