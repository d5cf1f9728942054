"""The bot's side of the data folder's disk budget (``sandbox.disk_budget``): the
channel workspaces' records and bounds (``workspaces``), and the background task that
measures the folder and reclaims old practice workspaces (``watch``)."""
