"""The git tools, called through the registry as the agent calls them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sandbox.paths import Workspace
from sandbox.process import Sandbox
from tools import ToolContext, default_registry

REGISTRY = default_registry()


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    if not Sandbox().sandboxed:
        pytest.fail("bubblewrap 0.8+ is missing, so sandboxed git cannot be tested. Fix: "
                    "apt-get install bubblewrap.", pytrace=False)
    return ToolContext.open("test", Workspace(tmp_path / "ws"), tmp_path / "state")


async def call(ctx: ToolContext, name: str, /, **arguments):
    return await REGISTRY.call(name, arguments, ctx)


async def ok(ctx: ToolContext, name: str, /, **arguments) -> str:
    result = await call(ctx, name, **arguments)
    assert result.ok, result.output
    return result.output


async def refused(ctx: ToolContext, name: str, /, **arguments) -> str:
    result = await call(ctx, name, **arguments)
    assert not result.ok, result.output
    return result.output


def ws_file(ctx: ToolContext, path: str) -> Path:
    return ctx.workspace.root / path


def host_git(ctx: ToolContext, *args: str) -> str:
    """Inspect the repository from the host (the tools never run git here)."""
    return subprocess.run(["git", "-c", "safe.directory=*", "-C", str(ctx.workspace.root), *args],
                          capture_output=True, text=True, check=True).stdout


async def committed(ctx: ToolContext, path: str, content: str, message: str) -> None:
    await ok(ctx, "write_file", path=path, content=content)
    await ok(ctx, "git_add", paths=[path])
    await ok(ctx, "git_commit", message=message)


async def test_the_first_git_tool_initialises_a_repository_and_says_so(ctx):
    first = await ok(ctx, "git_status")
    assert "initialized an empty one" in first and "No commits yet on main" in first
    assert ws_file(ctx, ".git/HEAD").is_file()
    assert "initialized" not in await ok(ctx, "git_status")
    assert "no commits yet" in await ok(ctx, "git_log")


async def test_status_add_commit_log_and_diff_work_together(ctx):
    await ok(ctx, "write_file", path="a.txt", content="one\n")
    assert "?? a.txt" in await ok(ctx, "git_status")
    staged = await ok(ctx, "git_add", paths=["a.txt"])
    assert "A  a.txt" in staged
    assert "+one" in await ok(ctx, "git_diff", staged=True)
    assert "first commit" in await ok(ctx, "git_commit", message="first commit")
    assert "nothing changed" in await ok(ctx, "git_status")
    await ok(ctx, "write_file", path="a.txt", content="two\n")
    diff = await ok(ctx, "git_diff", path="a.txt")
    assert "-one" in diff and "+two" in diff
    assert "no staged differences" in await ok(ctx, "git_diff", staged=True)
    await ok(ctx, "git_add", paths=["."])
    await ok(ctx, "git_commit", message="second")
    log = (await ok(ctx, "git_log", limit=5)).splitlines()
    assert [line.split(" ", 3)[3] for line in log] == ["second", "first commit"]
    assert len((await ok(ctx, "git_log", limit=1)).splitlines()) == 1


async def test_commit_with_nothing_staged_is_refused_with_what_to_do(ctx):
    out = await refused(ctx, "git_commit", message="empty")
    assert "nothing to commit" in out and "git_add" in out


async def test_commits_use_the_fixed_identity_and_ignore_a_gitconfig_in_the_workspace(ctx):
    ws_file(ctx, ".gitconfig").write_text("[user]\n\tname = Evil\n\temail = evil@example.com\n")
    await committed(ctx, "a.txt", "x\n", "identity")
    assert host_git(ctx, "log", "--format=%an <%ae>|%cn <%ce>").strip() == \
        "Nightshift <agent@nightshift.local>|Nightshift <agent@nightshift.local>"
    assert "Evil" not in ws_file(ctx, ".git/config").read_text()


async def test_hooks_in_the_repository_never_run(ctx):
    await ok(ctx, "git_status")
    hook = ws_file(ctx, ".git/hooks/pre-commit")
    hook.write_text("#!/bin/sh\ntouch /workspace/hooked\n")
    hook.chmod(0o755)
    await committed(ctx, "a.txt", "x\n", "no hooks")
    assert not ws_file(ctx, "hooked").exists()


async def test_checkout_file_restores_content_and_undo_brings_back_the_edit(ctx):
    await committed(ctx, "a.txt", "committed\n", "base")
    await ok(ctx, "write_file", path="a.txt", content="edited\n")
    out = await ok(ctx, "git_checkout_file", path="a.txt")
    assert "restored a.txt from HEAD" in out and "journaled" in out
    assert ws_file(ctx, "a.txt").read_text() == "committed\n"
    assert "git_checkout_file a.txt HEAD" in await ok(ctx, "history")
    await ok(ctx, "undo")
    assert ws_file(ctx, "a.txt").read_text() == "edited\n"


async def test_checkout_file_takes_a_file_from_an_older_commit(ctx):
    await committed(ctx, "a.txt", "v1\n", "one")
    await committed(ctx, "a.txt", "v2\n", "two")
    await ok(ctx, "git_checkout_file", path="a.txt", rev="HEAD~1")
    assert ws_file(ctx, "a.txt").read_text() == "v1\n"
    assert "git checkout failed" in await refused(ctx, "git_checkout_file", path="a.txt", rev="nope")


async def test_branches_are_created_listed_and_switched_with_working_files_journaled(ctx):
    await committed(ctx, "a.txt", "main\n", "on main")
    assert "Switched to a new branch 'feature'" in await ok(ctx, "git_branch", name="feature", create=True)
    await committed(ctx, "only-on-feature.txt", "f\n", "on feature")
    listing = await ok(ctx, "git_branch")
    assert "* feature" in listing and "  main" in listing
    switched = await ok(ctx, "git_branch", name="main")
    assert "deleted only-on-feature.txt" in switched
    assert not ws_file(ctx, "only-on-feature.txt").exists()
    await ok(ctx, "undo")  # the working file comes back; git's branch stays main
    assert ws_file(ctx, "only-on-feature.txt").read_text() == "f\n"
    assert "switch" in await refused(ctx, "git_branch", name="no-such-branch")
    assert "needs a name" in await refused(ctx, "git_branch", create=True)


async def test_option_injection_is_refused_before_git_runs(ctx):
    assert "starts with '-'" in await refused(ctx, "git_add", paths=["-rf"])
    assert "starts with '-'" in await refused(ctx, "git_add", paths=["a.txt", "--force"])
    assert "starts with '-'" in await refused(ctx, "git_diff", path="--output=/workspace/x")
    assert "starts with '-'" in await refused(ctx, "git_checkout_file", path="a.txt",
                                              rev="--output=/tmp/x")
    assert "starts with '-'" in await refused(ctx, "git_checkout_file", path="-f")
    assert "starts with '-'" in await refused(ctx, "git_branch", name="-D")
    for rev in ("HEAD@{1}", "main:secret.txt", "a b", "HEAD..main", "$(id)", "x;rm"):
        assert "refused revision" in await refused(ctx, "git_checkout_file", path="a.txt", rev=rev)
    assert not ws_file(ctx, "x").exists() and not ws_file(ctx, ".git").exists()


async def test_paths_outside_the_workspace_are_refused(ctx, tmp_path):
    (tmp_path / "outside.txt").write_text("host")
    assert "outside the workspace" in await refused(ctx, "git_add", paths=["/etc/passwd"])
    assert "not allowed" in await refused(ctx, "git_add", paths=["../outside.txt"])
    os.symlink(tmp_path / "outside.txt", ws_file(ctx, "link"))
    assert "outside the workspace" in await refused(ctx, "git_diff", path="link/x")


async def test_a_dot_git_that_is_a_link_is_refused(ctx, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", ws_file(ctx, ".git"))
    assert "not a folder" in await refused(ctx, "git_status")


def test_no_tool_reaches_remotes_or_changes_config():
    forbidden = ("push", "pull", "fetch", "remote", "clone", "submodule", "config")
    names = [n for n in REGISTRY.names() if n.startswith("git")]
    assert names == ["git_status", "git_diff", "git_log", "git_add", "git_commit",
                     "git_checkout_file", "git_branch"]
    assert not [n for n in names for word in forbidden if word in n]


async def test_git_tools_refuse_with_the_fix_when_bubblewrap_is_missing(ctx):
    box = Sandbox()
    box.bwrap = None
    ctx.services.sandbox = box
    out = await refused(ctx, "git_status")
    assert "bubblewrap" in out and "allow_unsandboxed" in out


async def test_a_huge_file_is_refused_at_once_unless_git_ignores_it(ctx):
    """A 10 GB (sparse) file kept git add hashing until its 60 s timeout (issue 11 part 5)."""
    with open(ws_file(ctx, "big.bin"), "wb") as f:
        f.truncate(10 * 2**30)
    ws_file(ctx, "small.txt").write_text("hi\n")
    for paths in (["big.bin"], ["."]):
        assert "big.bin is over 100 MiB" in await refused(ctx, "git_add", paths=paths)
    assert "A  small.txt" in await ok(ctx, "git_add", paths=["small.txt"])
    ws_file(ctx, ".gitignore").write_text("big.bin\n")
    assert "A  .gitignore" in await ok(ctx, "git_add", paths=["."])
    assert "big.bin" not in host_git(ctx, "ls-files")
