"""Reward for the task file-sum-01 of examples/arithmetic.jsonl.

Runs in the sandbox with the attempt's workspace as the working directory.
reward() returns 1 when answer.txt holds 42, 0.5 when it exists but holds
something else (the file was written: half the skill), 0 otherwise.
"""

from pathlib import Path


def reward(answer: str, workspace: str) -> float:
    path = Path(workspace) / "answer.txt"
    if not path.is_file():
        return 0.0
    return 1.0 if path.read_text().strip() == "42" else 0.5
