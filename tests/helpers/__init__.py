"""Helpers shared by the test modules (imported as `helpers.<module>`)."""

# seconds a test waits on a process it started before calling it hung: only a hang takes this long, also
# on a machine whose cores are shared four ways (a test must never fail because the machine is slow)
HANG_TIMEOUT = 1800
