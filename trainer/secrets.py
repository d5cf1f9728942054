"""The secret scan: an episode holding a secret never reaches training.

Three nets, any hit excludes the episode:
- the exact values of the configured secrets (each ``*_env`` key's value);
- detect-secrets' specific detectors (AWS, GitHub, Discord, OpenAI, Slack,
  private keys, and keyword assignments such as ``"password": "..."``), run
  line by line as on a ``.py`` file, whose keyword rules also cover JSON;
- our own patterns for ``sk-...``, ``hf_...`` and Discord bot tokens.

detect-secrets' high-entropy detectors are left out: on chat traces full of
hashes, base64 and UUIDs they flag clean text, and a false positive silently
drops a good episode from training.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PATTERNS = {
    "openai-key": re.compile(r"\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}"),
    "hf-token": re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"),
    "discord-token": re.compile(r"\b[MNO][A-Za-z\d_-]{23,27}\.[A-Za-z\d_-]{6}\.[A-Za-z\d_-]{27,40}\b"),
}
_FILENAME = "trace.py"  # selects detect-secrets' quoted-assignment keyword rules


@dataclass(frozen=True)
class Finding:
    kind: str
    line: int


class SecretScanner:
    def __init__(self, exact_values: list[str] = ()) -> None:
        from detect_secrets.plugins.aws import AWSKeyDetector
        from detect_secrets.plugins.discord import DiscordBotTokenDetector
        from detect_secrets.plugins.github_token import GitHubTokenDetector
        from detect_secrets.plugins.keyword import KeywordDetector
        from detect_secrets.plugins.openai import OpenAIDetector
        from detect_secrets.plugins.private_key import PrivateKeyDetector
        from detect_secrets.plugins.slack import SlackDetector

        # Very short "secrets" would match ordinary words and drop clean episodes.
        self.exact = [v for v in exact_values if v and len(v) >= 8]
        self.plugins = [AWSKeyDetector(), GitHubTokenDetector(), DiscordBotTokenDetector(),
                        OpenAIDetector(), SlackDetector(), PrivateKeyDetector(),
                        KeywordDetector()]

    def scan(self, text: str) -> list[Finding]:
        findings = []
        for value in self.exact:
            if value in text:
                findings.append(Finding("configured-secret", text[:text.index(value)].count("\n")))
        for number, line in enumerate(text.splitlines()):
            findings += [Finding(kind, number) for kind, rx in PATTERNS.items() if rx.search(line)]
            for plugin in self.plugins:
                if plugin.analyze_line(filename=_FILENAME, line=line, line_number=number):
                    findings.append(Finding(type(plugin).__name__, number))
        return findings

    def has_secret(self, text: str) -> bool:
        return bool(self.scan(text))
