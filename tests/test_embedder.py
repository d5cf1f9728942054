"""The offline numpy MiniLM embedder equals the reference BERT and works inside chromadb."""

from __future__ import annotations

import sys

import numpy as np

from core.storage.embedder import MiniLMEmbedder, model_dir

TEXTS = ["hello world", "The capital of France is Paris.", "word " * 400]


def test_numpy_embeddings_match_transformers_bert_mean_pooling():
    import torch
    from transformers import AutoTokenizer, BertModel

    ours = MiniLMEmbedder().embed(TEXTS)
    tok = AutoTokenizer.from_pretrained(model_dir())
    bert = BertModel.from_pretrained(model_dir()).eval()
    enc = tok(TEXTS, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = bert(**enc).last_hidden_state
    mask = enc.attention_mask[..., None].float()
    ref = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1).numpy()
    assert ours.shape == (3, 384)
    assert np.abs(ours - ref).max() < 1e-4


def test_chromadb_collection_finds_the_nearest_note():
    import chromadb

    client = chromadb.EphemeralClient()
    notes = client.get_or_create_collection("embedder-test", embedding_function=MiniLMEmbedder())
    notes.add(ids=["pets", "money"], documents=["cats are small pets", "the stock market fell"])
    assert notes.query(query_texts=["a kitten"], n_results=1)["ids"][0][0] == "pets"
    assert notes.query(query_texts=["shares lost value"], n_results=1)["ids"][0][0] == "money"


def test_importing_the_embedder_does_not_import_torch():
    import subprocess

    code = "import core.storage.embedder, sys; core.storage.embedder.MiniLMEmbedder().embed(['x']); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
