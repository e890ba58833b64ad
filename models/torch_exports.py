"""Optional torch.onnx exports: DistilBERT and a Llama decoder with KV cache (transformers), hand-written ResNet-50 and
MobileNetV2.

Tested with torch 2.13.0+cpu, transformers 5.24.0 and onnxscript 0.7.2 (Python 3.11): each export built twice
byte-identical and valid (tests/models/test_models.py), tinylm_torch also by test_decoder.py. The decoder wrapper
needs transformers' layered cache API (DynamicCache(config=...), `cache.layers[i].keys / .values`), which older
releases lack."""
from __future__ import annotations

import logging
import math
import warnings
import zlib

import onnx
import torch
from torch import nn

from .calibrate import quantize_mean, quantize_std

OPSET = 18  # the lowest opset torch's dynamo exporter emits without a lossy version conversion
SEQ = 128


def build(name: str) -> onnx.ModelProto:
    torch.manual_seed(zlib.crc32(name.encode()))
    with torch.no_grad():
        model, args, in_names, out_names = _MODELS[name]()
        _randomize_constant_params(model)
        if any(isinstance(m, nn.BatchNorm2d) for m in model.modules()):
            _calibrate(model, args)
        model.eval()
    proto = _export(model, args, in_names, out_names, getattr(model, "dynamic_shapes", None))
    if isinstance(model, _CausalLM):
        model.name_dims(proto)
    proto.producer_name, proto.producer_version = "edgec.models", ""  # not the torch version
    return proto


def _export(model: nn.Module, args: tuple, in_names: list[str], out_names: list[str],
            dynamic_shapes: tuple | None = None) -> onnx.ModelProto:
    # The exporter warns about torchvision ops and torch-internal deprecations: noise for our users.
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(model, args, input_names=in_names, output_names=out_names,
                                        opset_version=OPSET, dynamo=True, external_data=False,
                                        dynamic_shapes=dynamic_shapes, verbose=False)
    finally:
        logger.setLevel(level)
    return program.model_proto


def _randomize_constant_params(model: nn.Module) -> None:
    """Default inits leave norm weights at 1 and biases at 0; uniform tensors hide tiling bugs."""
    for name, p in model.named_parameters():
        flat = p.detach().reshape(-1)
        if flat.numel() > 1 and bool((flat == flat[0]).all()):
            if name.endswith("weight"):  # LayerNorm / BatchNorm scale
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0.0, 0.02)


def _calibrate(model: nn.Module, args: tuple) -> None:
    """One train-mode pass normalises every BN on batch statistics and records them as the running
    statistics (momentum None = plain average), which are then rounded like calibrate.py does."""
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
    model.train()
    model(*args)
    for bn in bns:
        std_q = quantize_std(bn.running_var.sqrt().numpy())
        bn.running_mean.copy_(torch.from_numpy(quantize_mean(bn.running_mean.numpy(), std_q)))
        bn.running_var.copy_(torch.from_numpy(std_q * std_q))
        bn.momentum = 0.1


def _image() -> torch.Tensor:
    return torch.randn(1, 3, 224, 224)


def _distilbert():
    from transformers import DistilBertConfig, DistilBertModel

    # The default config is distilbert-base-uncased's shape. Eager attention: the sdpa path drops
    # an all-ones mask by inspecting its values, which tracing would bake in.
    model = DistilBertModel(DistilBertConfig(attn_implementation="eager"))
    ids = torch.randint(0, 30522, (1, SEQ))
    mask = torch.ones(1, SEQ, dtype=torch.int64)
    mask[:, SEQ - SEQ // 4:] = 0
    return _Hidden(model), (ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state"]


class _Hidden(nn.Module):
    """Returns the tensor rather than a ModelOutput, so the export has one named output."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def _tinylm():
    """transformers' LlamaForCausalLM at models/decoder.py's tinylm shape, random weights scaled as there."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from .decoder import CONFIGS

    cfg = CONFIGS["tinylm"]
    # Eager attention: the sdpa path inspects the mask's values, which tracing would bake in.
    config = LlamaConfig(vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
                         num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                         num_key_value_heads=cfg.kv_heads, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.eps,
                         tie_word_embeddings=False, attn_implementation="eager")
    model = LlamaForCausalLM(config)
    # HF's N(0, 0.02) leaves attention uniform and logits flat at this size; decoder.py's scales do not.
    for name, p in model.named_parameters():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            p.normal_(0.0, 1 / math.sqrt(2 * cfg.layers * p.shape[1]))
        elif name == "lm_head.weight":
            p.normal_(0.0, 2 / math.sqrt(p.shape[1]))
        elif name.endswith("embed_tokens.weight"):
            p.normal_(0.0, 1.0)
        elif p.dim() == 2:
            p.normal_(0.0, 1 / math.sqrt(p.shape[1]))
    wrapper = _CausalLM(model, cfg.layers)
    # Traced with batch 2, 4 new tokens after 3 cached ones: sizes 0 and 1 would be specialised.
    batch, seq, past = 2, 4, 3
    cache = tuple(torch.randn(batch, cfg.kv_heads, past, cfg.head_dim) for _ in range(2 * cfg.layers))
    args = (torch.randint(0, cfg.vocab, (batch, seq)), torch.ones(batch, past + seq, dtype=torch.int64),
            torch.arange(past, past + seq).expand(batch, seq), cache)
    slots = [f"{i}.{kv}" for i in range(cfg.layers) for kv in ("key", "value")]
    return (wrapper, args, ["input_ids", "attention_mask", "position_ids", *(f"past_key_values.{s}" for s in slots)],
            ["logits", *(f"present.{s}" for s in slots)])


class _CausalLM(nn.Module):
    """optimum's decoder interface over a transformers causal LM: flat cache tensors in and out."""

    def __init__(self, inner: nn.Module, layers: int):
        super().__init__()
        self.inner, self.layers = inner, layers
        auto = torch.export.Dim.AUTO
        self.dynamic_shapes = ({0: auto, 1: auto},) * 3 + (tuple({0: auto, 2: auto} for _ in range(2 * layers)),)

    def forward(self, input_ids, attention_mask, position_ids, past):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.inner.config)
        for i in range(self.layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True)
        return (out.logits, *(t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)))

    @staticmethod
    def name_dims(proto: onnx.ModelProto) -> None:
        """torch.export's symbols (s10, s69 + s70, ...) renamed to optimum's dimension names."""
        def dims(name: str):
            vi = next(v for v in proto.graph.input if v.name == name)
            return vi.type.tensor_type.shape.dim

        batch, seq = (d.dim_param for d in dims("input_ids"))
        mask_batch, total = (d.dim_param for d in dims("attention_mask"))
        names = {batch: "batch", mask_batch: "batch", seq: "sequence_length", total: "total_sequence_length"}
        for vi in proto.graph.input:  # each cache input gets its own symbol for the past length
            if vi.name.startswith("past_key_values."):
                past = vi.type.tensor_type.shape.dim[2].dim_param
                names.update({past: "past_sequence_length", f"{past} + {seq}": "total_sequence_length"})
        for vi in (*proto.graph.input, *proto.graph.output, *proto.graph.value_info):
            for d in vi.type.tensor_type.shape.dim:
                if d.dim_param in names:
                    d.dim_param = names[d.dim_param]


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    conv = nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False)
    nn.init.kaiming_normal_(conv.weight, mode="fan_in", nonlinearity="relu")
    bn = nn.BatchNorm2d(cout)
    nn.init.uniform_(bn.weight, 0.5, 1.5)
    nn.init.normal_(bn.bias, 0.0, 0.1)
    return [conv, bn]


class _Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(*_conv_bn(cin, width, 1), nn.ReLU(),
                                  *_conv_bn(width, width, 3, stride), nn.ReLU(),
                                  *_conv_bn(width, cout, 1))
        self.down = (nn.Sequential(*_conv_bn(cin, cout, 1, stride))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        return torch.relu(self.body(x) + self.down(x))


def _resnet50():
    layers: list[nn.Module] = [*_conv_bn(3, 64, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for i in range(blocks):
            layers.append(_Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), _linear(2048, 1000)]
    return nn.Sequential(*layers), (_image(),), ["input"], ["logits"]


class _InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, t: int):
        super().__init__()
        hidden = cin * t
        expand = [*_conv_bn(cin, hidden, 1), nn.ReLU6()] if t != 1 else []
        self.body = nn.Sequential(*expand, *_conv_bn(hidden, hidden, 3, stride, hidden), nn.ReLU6(),
                                  *_conv_bn(hidden, cout, 1))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


def _mobilenetv2():
    from .cnn import _MBV2  # same settings table as the onnx.helper build

    layers: list[nn.Module] = [*_conv_bn(3, 32, 3, 2), nn.ReLU6()]
    cin = 32
    for t, c, n, s in _MBV2:
        for i in range(n):
            layers.append(_InvertedResidual(cin, c, s if i == 0 else 1, t))
            cin = c
    layers += [*_conv_bn(cin, 1280, 1), nn.ReLU6(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
               _linear(1280, 1000)]
    return nn.Sequential(*layers), (_image(),), ["input"], ["logits"]


def _linear(cin: int, cout: int) -> nn.Linear:
    fc = nn.Linear(cin, cout)
    nn.init.kaiming_normal_(fc.weight, mode="fan_in", nonlinearity="relu")
    nn.init.normal_(fc.bias, 0.0, 0.01)
    return fc


_MODELS = {"distilbert_torch": _distilbert, "resnet50_torch": _resnet50,
           "mobilenetv2_torch": _mobilenetv2, "tinylm_torch": _tinylm}
