"""send_file: the agent asks the front end to upload a workspace file with its reply.

The tool only checks the file and hands its workspace-relative name to
``ctx.send_file``; the front end opens it again at send time through
``Workspace.open`` (no symlink followed), so a file swapped for a link in
between cannot leak a host file. The size limit matches Discord's default
upload limit, so the agent hears "too large" now rather than after its turn.
"""

from __future__ import annotations

from tools import ToolContext, ToolError, tool
from tools.sizes import human_size

MAX_SEND_BYTES = 8 * 2**20


@tool
def send_file(ctx: ToolContext, path: str) -> str:
    """Send a file from your workspace to the user; it is uploaded together with your reply.

    Args:
        path: The file to send, relative to your workspace (at most 8 MiB).
    """
    if ctx.send_file is None:
        raise ToolError("this front end cannot send files; tell the user the file's path "
                        "in your workspace instead")
    target = ctx.workspace.resolve(path)
    if not target.exists():
        raise ToolError(f"{path} does not exist; list_dir shows what is there")
    if target.is_dir():
        raise ToolError(f"{path} is a folder; only single files can be sent (pack a folder "
                        "into a .zip with python first)")
    if not target.is_file():
        raise ToolError(f"{path} is not a regular file and cannot be sent")
    size = target.stat().st_size
    if size > MAX_SEND_BYTES:
        raise ToolError(f"{path} is {human_size(size)}; files up to {human_size(MAX_SEND_BYTES)} "
                        "can be sent. Compress or split it first")
    relative = ctx.workspace.relative(target)
    ctx.send_file(relative)
    return f"{relative} ({human_size(size)}) will be sent with your reply"
