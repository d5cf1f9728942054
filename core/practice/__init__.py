"""Practice sets and their checks, shared by ``/practice`` (the day) and the gate (the
night): ``sets`` reads a set (standard library only) and splits it; ``checks`` judges an
answer (exact in process; regex and python in the sandbox, under a timeout)."""
