"""The secret scan: recall on a planted corpus, and no false positives on clean traces."""

from __future__ import annotations

from trainer.secrets import SecretScanner

CONFIGURED = "nightshift-discord-Zq81-token-value"
PLANTED = {
    "aws": "here are the creds: AKIAIOSFODNN7EXAMPLE",
    "github": "push with 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 please",
    "discord": "bot token MTk4NjIyNDgzNDcxOTI1MjQ4.Cl2FMQ.ZnCjm1XVW7vRze4b7Cq4se7kKWs",
    "openai": "OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstT3BlbkFJabcdefghijklmnopqrst",
    "slack": "webhook token xoxb-123456789012-1234567890123-abcdefghijABCDEFGHIJabcd",
    "huggingface": "use hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789 to download",
    "private-key": "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7\n-----END RSA PRIVATE KEY-----",
    "json-password": '{"user": "ana", "password": "hunter2-correct-horse"}',
    "configured": f"the token is {CONFIGURED} ok",
}
CLEAN = [
    "What is the capital of France? The capital of France is Paris.",
    "I wrote notes.txt with 3 lines; run `python3 main.py` to test it.",
    "The commit is 3f786850e387550fdab836ed7e6dc881de23001b on branch main.",
    "uuid 123e4567-e89b-12d3-a456-426614174000 and sha256 "
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Your password should be at least 12 characters long; store it in a password manager.",
    'password = input("Password: ")',
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
    '{"path": "skills/sky-notes.md", "k": 5, "query": "how to skip tests"}',
    "Discord message id 1089123456789012345 in channel 987654321098765432.",
    "The model hf_dir is data/models/smollm2-135m-instruct-hf (float32).",
]


def test_every_planted_secret_is_found():
    scanner = SecretScanner([CONFIGURED])
    found = {name for name, text in PLANTED.items() if scanner.has_secret(text)}
    assert found == set(PLANTED), f"missed: {set(PLANTED) - found}"


def test_clean_traces_give_no_false_positives():
    scanner = SecretScanner([CONFIGURED])
    hits = {text[:40]: scanner.scan(text) for text in CLEAN if scanner.has_secret(text)}
    assert hits == {}


def test_short_configured_values_are_not_matched_as_words():
    assert not SecretScanner(["abc"]).has_secret("abc is a common prefix")
