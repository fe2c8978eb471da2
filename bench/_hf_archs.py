"""The architectures of ``bench/hf_zoo.py``: small ``transformers`` configs (2 layers, hidden 32,
vocabulary 128) and the inputs each model takes. Read by the zoo's export step only (needs
torch and transformers); the run step reads the saved feeds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ARCHS", "Arch", "VOCAB", "example_inputs"]

VOCAB = 128
BATCH, SEQ, DEC_SEQ = 2, 8, 6

_BERT = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
)
_DECODER = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
)
_SEQ2SEQ = dict(
    vocab_size=VOCAB,
    d_model=32,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    pad_token_id=1,
    decoder_start_token_id=2,
)
_VIT = dict(
    image_size=32,
    patch_size=8,
    num_channels=3,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
)


@dataclass
class Arch:
    """One architecture: ``transformers.<config>(**kwargs)`` -> ``transformers.<model>``;
    ``inputs`` names the kind of example inputs (``example_inputs``); ``part``: a sub-module
    exported instead of the whole model (``"encoder"``: ``model.get_encoder()``)."""

    name: str
    kind: str
    config: str
    model: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    inputs: str = "text"
    part: str = ""


def _a(name: str, kind: str, config: str, model: str, inputs: str = "text", part: str = "", **kw):
    return Arch(name, kind, config, model, kw, inputs, part)


ARCHS: list[Arch] = [
    # encoders
    _a("bert", "encoder", "BertConfig", "BertModel", **_BERT),
    _a("roberta", "encoder", "RobertaConfig", "RobertaModel", **_BERT),
    _a("xlm-roberta", "encoder", "XLMRobertaConfig", "XLMRobertaModel", **_BERT),
    _a("camembert", "encoder", "CamembertConfig", "CamembertModel", **_BERT),
    _a("data2vec-text", "encoder", "Data2VecTextConfig", "Data2VecTextModel", **_BERT),
    _a("ernie", "encoder", "ErnieConfig", "ErnieModel", **_BERT),
    _a("electra", "encoder", "ElectraConfig", "ElectraModel", embedding_size=16, **_BERT),
    _a("albert", "encoder", "AlbertConfig", "AlbertModel", embedding_size=16, **_BERT),
    _a(
        "distilbert", "encoder", "DistilBertConfig", "DistilBertModel",
        vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
        max_position_embeddings=64,
    ),
    _a("deberta", "encoder", "DebertaConfig", "DebertaModel", **_BERT),
    _a("deberta-v2", "encoder", "DebertaV2Config", "DebertaV2Model", **_BERT),
    _a("mpnet", "encoder", "MPNetConfig", "MPNetModel", **_BERT),
    _a("convbert", "encoder", "ConvBertConfig", "ConvBertModel", embedding_size=32, **_BERT),
    _a(
        "squeezebert", "encoder", "SqueezeBertConfig", "SqueezeBertModel", embedding_size=32,
        q_groups=2, k_groups=2, v_groups=2, post_attention_groups=2, intermediate_groups=2,
        output_groups=2, **_BERT,
    ),
    _a(
        "mobilebert", "encoder", "MobileBertConfig", "MobileBertModel",
        embedding_size=16, intra_bottleneck_size=16, true_hidden_size=16,
        num_feedforward_networks=1, **_BERT,
    ),
    _a(
        "funnel", "encoder", "FunnelConfig", "FunnelBaseModel",
        vocab_size=VOCAB, block_sizes=[1, 1], d_model=32, n_head=2, d_head=16, d_inner=64,
    ),
    _a("layoutlm", "encoder", "LayoutLMConfig", "LayoutLMModel", inputs="text+bbox", **_BERT),
    _a(
        "modernbert", "encoder", "ModernBertConfig", "ModernBertModel",
        global_attn_every_n_layers=2, local_attention=4, pad_token_id=0, bos_token_id=2,
        eos_token_id=3, cls_token_id=2, sep_token_id=3, **_BERT,
    ),
    # decoders
    _a(
        "gpt2", "decoder", "GPT2Config", "GPT2Model",
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64,
    ),
    _a(
        "gpt-bigcode", "decoder", "GPTBigCodeConfig", "GPTBigCodeModel",
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64,
    ),
    _a(
        "gpt-neo", "decoder", "GPTNeoConfig", "GPTNeoModel",
        vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2,
        attention_types=[[["global", "local"], 1]], window_size=4, max_position_embeddings=64,
    ),
    _a(
        "gptj", "decoder", "GPTJConfig", "GPTJModel",
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, rotary_dim=8, n_positions=64,
    ),
    _a(
        "codegen", "decoder", "CodeGenConfig", "CodeGenModel",
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, rotary_dim=8, n_positions=64, n_ctx=64,
    ),
    _a("gpt-neox", "decoder", "GPTNeoXConfig", "GPTNeoXModel", **_DECODER),
    _a(
        "opt", "decoder", "OPTConfig", "OPTModel",
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        ffn_dim=64, word_embed_proj_dim=32, max_position_embeddings=64,
    ),
    _a(
        "bloom", "decoder", "BloomConfig", "BloomModel",
        vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=2,
    ),
    _a("llama", "decoder", "LlamaConfig", "LlamaModel", num_key_value_heads=1, **_DECODER),
    _a("mistral", "decoder", "MistralConfig", "MistralModel", num_key_value_heads=1, **_DECODER),
    _a("qwen2", "decoder", "Qwen2Config", "Qwen2Model", num_key_value_heads=1, **_DECODER),
    _a(
        "qwen3", "decoder", "Qwen3Config", "Qwen3Model", head_dim=16, num_key_value_heads=1,
        **_DECODER,
    ),
    _a("phi", "decoder", "PhiConfig", "PhiModel", **_DECODER),
    _a("phi3", "decoder", "Phi3Config", "Phi3Model", pad_token_id=0, **_DECODER),
    _a(
        "gemma", "decoder", "GemmaConfig", "GemmaModel", head_dim=16, num_key_value_heads=1,
        **_DECODER,
    ),
    _a(
        "stablelm", "decoder", "StableLmConfig", "StableLmModel", num_key_value_heads=1,
        **_DECODER,
    ),
    _a("olmo", "decoder", "OlmoConfig", "OlmoModel", **_DECODER),
    _a("starcoder2", "decoder", "Starcoder2Config", "Starcoder2Model", **_DECODER),
    _a(
        "falcon", "decoder", "FalconConfig", "FalconModel",
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
    ),
    # encoder-decoders
    _a(
        "t5", "encoder-decoder", "T5Config", "T5Model", inputs="seq2seq",
        vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2,
        decoder_start_token_id=0,
    ),
    _a("bart", "encoder-decoder", "BartConfig", "BartModel", inputs="seq2seq", **_SEQ2SEQ),
    _a("mbart", "encoder-decoder", "MBartConfig", "MBartModel", inputs="seq2seq", **_SEQ2SEQ),
    _a("marian", "encoder-decoder", "MarianConfig", "MarianModel", inputs="seq2seq", **_SEQ2SEQ),
    _a(
        "pegasus", "encoder-decoder", "PegasusConfig", "PegasusModel", inputs="seq2seq",
        **_SEQ2SEQ,
    ),
    # vision
    _a("vit", "vision", "ViTConfig", "ViTModel", inputs="image", **_VIT),
    _a("deit", "vision", "DeiTConfig", "DeiTModel", inputs="image", **_VIT),
    _a("beit", "vision", "BeitConfig", "BeitModel", inputs="image", vocab_size=VOCAB, **_VIT),
    _a(
        "convnext", "vision", "ConvNextConfig", "ConvNextModel", inputs="image",
        hidden_sizes=[8, 16], depths=[1, 1], image_size=32, num_stages=2,
    ),
    _a(
        "resnet", "vision", "ResNetConfig", "ResNetModel", inputs="image",
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
    ),
    _a(
        "regnet", "vision", "RegNetConfig", "RegNetModel", inputs="image",
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=8,
    ),
    _a(
        "swin", "vision", "SwinConfig", "SwinModel", inputs="image",
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2],
        window_size=4,
    ),
    _a(
        "mobilevit", "vision", "MobileViTConfig", "MobileViTModel", inputs="image",
        image_size=32, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 48],
        initializer_range=0.5,  # at 0.02 the output vanishes to exactly 0 (a constant)
    ),
    # audio
    _a(
        "whisper-encoder", "audio", "WhisperConfig", "WhisperModel", inputs="audio-features",
        part="encoder", vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=16,
        max_target_positions=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1,
    ),
    _a(
        "wav2vec2", "audio", "Wav2Vec2Config", "Wav2Vec2Model", inputs="audio-wave",
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
    ),
]  # fmt: skip


def example_inputs(arch: Arch, seed: int = 0) -> dict[str, Any]:
    """Seeded numpy inputs for ``arch``: token ids in range (special ids below 4 left out),
    masks of ones, boxes with x0 <= x1 and y0 <= y1, normal pixels and audio."""
    import numpy as np

    rng = np.random.default_rng(seed)

    def ids(n: int) -> Any:
        return rng.integers(4, VOCAB, (BATCH, n)).astype(np.int64)

    kind = arch.inputs
    if kind in ("text", "text+bbox"):
        out = {"input_ids": ids(SEQ), "attention_mask": np.ones((BATCH, SEQ), np.int64)}
        if kind == "text+bbox":
            a = rng.integers(0, 500, (BATCH, SEQ, 2))
            b = a + rng.integers(0, 500, (BATCH, SEQ, 2))
            out["bbox"] = np.concatenate([a, b], -1).astype(np.int64)
        return out
    if kind == "seq2seq":
        return {
            "input_ids": ids(SEQ),
            "attention_mask": np.ones((BATCH, SEQ), np.int64),
            "decoder_input_ids": ids(DEC_SEQ),
        }
    if kind == "image":
        return {"pixel_values": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}
    if kind == "audio-features":
        frames = 2 * arch.kwargs["max_source_positions"]
        shape = (1, arch.kwargs["num_mel_bins"], frames)
        return {"input_features": rng.standard_normal(shape).astype(np.float32)}
    if kind == "audio-wave":
        return {"input_values": rng.standard_normal((1, 400)).astype(np.float32)}
    raise ValueError(f"unknown input kind {kind!r}")
