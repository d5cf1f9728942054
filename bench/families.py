"""The task families of bench/learning.py, generated deterministically.

Each family makes unique items from a seeded generator; the first ``held``
items are held out and the next ``train`` are practised, so the two are
disjoint by construction (no prompt is in both). Items are practice-set tasks
(``{"id", "prompt", "check"}``) and are written as practice-set files, so
the bench scores them with the product's own parser and checks:

- ``arithmetic``: a sum, difference or product of two numbers, answered with
  only the number (exact check);
- ``protocol``: an exact output format: a given word in upper case between
  square brackets and nothing else (exact check);
- ``compare``: the larger of two two-digit numbers; a python check passes an
  answer whose first number is the larger, in any words. A choice between
  two answers the prompt names, with no reference: the embedded model is
  right a fair share of the time before any night, so its practice groups
  hold passing and failing attempts side by side, and only the
  group-relative loss can teach it;
- ``last``: the word that comes last in a list of four the prompt gives; a python
  check passes an answer whose first word from the list is the last one, in any
  words. No reference. The embedded model is right about a third of the time
  before any night (it names a word of the list, often another, or one it made
  up): unlike ``compare``, whose rule (which number is larger) a 135M model does
  not learn in a night, the rule here is one it can follow (copy a word from a
  place in the prompt), the same on every item, so what its passing attempts share
  can carry to held-out items;
- ``tool``: choosing the right tool with the right arguments: make a folder,
  or write a file with a given content; a python check (in the sandbox)
  reads the workspace: 1 when it is exactly right, 0.5 for the right kind of
  object with the wrong content, else 0. Its reference shows the call
  (``write_file``), run in the sandbox when no attempt passed.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "rocket", "garden",
         "silver", "candle", "forest", "window", "bottle", "castle", "pencil", "orange",
         "planet", "button", "shadow", "anchor", "basket", "copper", "dragon", "falcon",
         "harbor", "island", "jacket", "kettle", "ladder", "marble", "needle", "oyster",
         "parrot", "quartz", "rabbit", "saddle", "tunnel", "violet", "walnut", "bridge",
         "camera", "desert", "engine", "feather", "ginger", "helmet", "igloo", "jungle",
         "ketchup", "lantern", "mirror", "noodle", "orchid", "pepper", "pillow", "salmon",
         "tomato", "umbrella", "valley", "wagon", "yogurt", "zipper", "bucket", "cactus",
         "dolphin", "eagle", "fossil", "guitar", "hammer", "insect", "jigsaw", "koala",
         "lizard", "magnet"]
OPS = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b}

DIR_CHECK = """from pathlib import Path
def reward(answer, workspace):
    path = Path(workspace) / {name!r}
    return 1.0 if path.is_dir() else 0.5 if path.exists() else 0.0
"""
CHOICE_CHECK = """import re
def reward(answer, workspace):
    numbers = re.findall(r"\\d+", answer)
    return 1.0 if numbers[:1] == [{big!r}] else 0.0
"""
LIST_CHECK = """import re
def reward(answer, workspace):
    listed = {words!r}
    named = [w for w in re.findall(r"[a-z]+", answer.lower()) if w in listed]
    return 1.0 if named[:1] == [{last!r}] else 0.0
"""
FILE_CHECK = """from pathlib import Path
def reward(answer, workspace):
    path = Path(workspace) / {name!r}
    if not path.is_file():
        return 0.0
    return 1.0 if path.read_text(errors="replace").strip() == {text!r} else 0.5
"""


def arithmetic(rng: random.Random) -> dict:
    a, b, op = rng.randint(2, 40), rng.randint(2, 40), rng.choice(list(OPS))
    if op == "times":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
    return {"id": f"arithmetic-{a}-{op}-{b}",
            "prompt": f"What is {a} {op} {b}? Answer with only the number.",
            "check": {"exact": str(OPS[op](a, b))}}


def protocol(rng: random.Random) -> dict:
    word = rng.choice(WORDS)
    return {"id": f"protocol-{word}",
            "prompt": f"Reply with the word {word} in upper case between square brackets, "
                      "and nothing else.",
            "check": {"exact": f"[{word.upper()}]"}}


def compare(rng: random.Random) -> dict:
    a, b = rng.sample(range(10, 100), 2)
    return {"id": f"compare-{a}-{b}",
            "prompt": f"Which number is larger, {a} or {b}?",
            "code": CHOICE_CHECK.format(big=str(max(a, b)), small=str(min(a, b)))}


def last(rng: random.Random) -> dict:
    words = rng.sample(WORDS, 4)
    return {"id": "last-" + "-".join(words),
            "prompt": f"Here is a list of words: {', '.join(words)}. Which word comes last "
                      "in the list?",
            "code": LIST_CHECK.format(words=words, last=words[-1])}


def tool(rng: random.Random) -> dict:
    word, other = rng.sample(WORDS, 2)
    if rng.random() < 0.5:
        name = f"{word}-box"
        # The reference uses write_file, which makes missing folders: the embedded model's
        # core tools (agent.tools = "auto") have no make_dir.
        return {"id": f"tool-dir-{name}", "prompt": f"Create a folder named {name} in your "
                "workspace.", "code": DIR_CHECK.format(name=name),
                "reference": {"calls": [{"name": "write_file", "arguments": {
                    "path": f"{name}/README.md", "content": f"# {name}"}}],
                    "answer": f"I created the folder {name}."}}
    name = f"{word}.txt"
    return {"id": f"tool-file-{word}-{other}",
            "prompt": f"Create a file named {name} that contains exactly the word {other}.",
            "code": FILE_CHECK.format(name=name, text=other),
            "reference": {"calls": [{"name": "write_file", "arguments": {
                "path": name, "content": other}}], "answer": f"I created {name}."}}


FAMILIES = {"arithmetic": arithmetic, "protocol": protocol, "compare": compare, "last": last,
            "tool": tool}


def items(family: str, train: int, held: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(train, held-out) items of ``family``: unique, disjoint, the same for the same seed.

    A family with fewer distinct items than asked keeps its held-out split whole (it is
    what is measured) and practises the rest, so fewer train items; the caller says so.
    Only a family that cannot fill its held-out split and one train item is refused."""
    rng = random.Random(f"{family}:{seed}")
    made: dict[str, dict] = {}
    for _ in range((train + held) * 50):
        item = FAMILIES[family](rng)
        made.setdefault(item["id"], item)
        if len(made) == train + held:
            break
    if len(made) <= held:
        raise ValueError(f"the {family} family has {len(made)} distinct items: too few for "
                         f"{held} held out and one to practise")
    ordered = list(made.values())
    return ordered[held:], ordered[:held]


def write_set(directory: Path, name: str, tasks: list[dict]) -> Path:
    """A practice-set file (and its python check files) for ``tasks``."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for task in tasks:
        task = dict(task)
        code = task.pop("code", None)
        if code is not None:
            check_file = directory / "checks" / f"{task['id']}.py"
            check_file.parent.mkdir(exist_ok=True)
            check_file.write_text(code)
            task["check"] = {"python": f"checks/{check_file.name}"}
        lines.append(json.dumps(task))
    path = directory / f"{name}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path
