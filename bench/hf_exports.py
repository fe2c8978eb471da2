"""Tiny Hugging Face BERT and GPT-2 exports for the NPU tests and bench (needs torch and
transformers; the tests read the committed .onnx files and need neither).

    HF_HUB_OFFLINE=1 python bench/hf_exports.py [--out tests/data]

Randomly initialised (seeded) from tiny configs, no model hub: 2 layers, hidden 32, 2 heads,
vocabulary 128. Exported with ``torch.onnx.export(dynamo=True)`` (needs onnxscript; the
TorchScript exporter has no rule for the ``aten::diff`` transformers 5 masks use), opset 18,
batch and sequence dynamic; the output is ``last_hidden_state``. Not in any extra: CI stays
light (torch is large); re-run this only to change the models.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SEED = 0


def _bert():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        attn_implementation="eager",
    )
    return BertModel(cfg, add_pooling_layer=False), ["input_ids", "attention_mask"]


def _gpt2():
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(
        vocab_size=128,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=128,
        use_cache=False,
        attn_implementation="eager",
    )
    return GPT2Model(cfg), ["input_ids"]


def export(name: str, out_dir: str) -> str:
    """Build ``name`` ("bert" or "gpt2") seeded and write ``<out_dir>/hf_<name>_tiny.onnx``."""
    import torch

    torch.manual_seed(SEED)
    model, inputs = {"bert": _bert, "gpt2": _gpt2}[name]()
    model.eval()

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, input_ids, attention_mask=None):
            kw = {"input_ids": input_ids}
            if attention_mask is not None:
                kw["attention_mask"] = attention_mask
            return self.inner(**kw, use_cache=False, return_dict=True).last_hidden_state

    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(SEED))
    args = (ids, torch.ones_like(ids))[: len(inputs)]
    path = os.path.join(out_dir, f"hf_{name}_tiny.onnx")
    dims = {0: torch.export.Dim("B", max=16), 1: torch.export.Dim("S", min=2, max=128)}
    program = torch.onnx.export(
        Wrapped(),
        args,
        input_names=inputs,
        output_names=["last_hidden_state"],
        dynamic_shapes=tuple([dims] * len(inputs)),
        opset_version=18,
        dynamo=True,
        optimize=True,
    )
    program.save(path)
    import onnx

    model_proto = onnx.load(path)
    for node in model_proto.graph.node:  # the exporter's stack traces name this machine's paths
        del node.metadata_props[:]
    onnx.save(model_proto, path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name in ("bert", "gpt2"):
        path = export(name, args.out)
        print(f"{path}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
