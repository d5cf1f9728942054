"""The sandbox: the workspace jail (``paths``) and the process runner (``process``);
``sealed`` runs a program with no workspace (the parse worker, ``tools.worker``).

A leaf package: it imports nothing from ``bot``, ``tools`` or ``trainer``.
``python -m sandbox run --workspace DIR -- CMD ...`` runs a command exactly
as the tools do.
"""

from sandbox.paths import PathEscape, Workspace, workspace_for
from sandbox.process import Limits, ProcessResult, Sandbox, SandboxUnavailable

__all__ = ["Limits", "PathEscape", "ProcessResult", "Sandbox", "SandboxUnavailable", "Workspace",
           "workspace_for"]
