"""The simulated cluster: rank processes, their process groups and the watchdog over them
(``pool``, ``worker``), parallel layouts (``layout``), the cluster self-check and the
cluster faults (a crash, a stall, a SIGKILL, a barrier on the wrong group)."""
