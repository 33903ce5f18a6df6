"""NVIDIA Xid codes: what each means and what to do, one table for both readers of them.

The agent reads Xids from NVML (the dashboard's XID alert, dashboard/detect.py) and the log classifier finds
them in kernel lines pasted with a server's log (`NVRM: Xid (PCI:0000:43:00): 13, ...`, agents/logscan.py).
Sources: NVIDIA's Xid catalog (https://docs.nvidia.com/deploy/xid-errors/index.html) and its GPU memory error
management guide (row remapping).
"""

from __future__ import annotations

XID_MEANINGS: dict[int, tuple[str, str]] = {
    13: (
        "Graphics engine exception",
        "usually the application or driver: check the server's log for an illegal access",
    ),
    31: ("GPU memory page fault", "usually an application bug (illegal address); restart the server"),
    43: ("GPU stopped processing", "the GPU hung; restart the application, reset the GPU if it recurs"),
    45: (
        "Preemptive cleanup after an earlier error",
        "a follow-on: the Xid logged before it on this GPU is the cause; restart the application",
    ),
    48: (
        "Double-bit ECC error",
        "uncorrectable memory error: drain the node, reset the GPU, replace it if it recurs",
    ),
    79: (
        "GPU has fallen off the bus",
        "the GPU is gone from PCIe: cold reboot the node; check power, riser, seating",
    ),
    94: ("Contained ECC error", "restart the application that hit it; other processes may keep running"),
    95: ("Uncontained ECC error", "reset the GPU (all processes on it are affected)"),
    109: ("Context switch timeout", "the GPU stopped switching work: restart the application, reset the GPU"),
    119: (
        "GSP RPC timeout",
        "the GPU firmware stopped answering: reset the GPU or reboot; update the driver",
    ),
    149: ("NVLink fatal error", "reset the GPU or reboot; if it recurs, check the NVLink fabric and bridge"),
}
UNKNOWN = ("NVIDIA driver error", "look the code up in NVIDIA's Xid catalog")
# Row remapping recorded (63, 64) and a high single-bit ECC rate (92): the driver informs, nothing failed.
INFORMATIONAL = frozenset({63, 64, 92})
CRITICAL = frozenset({48, 79, 95, 119, 149})


def describe(code: int) -> tuple[str, str]:
    """(meaning, what to do) of an Xid code."""
    return XID_MEANINGS.get(code, UNKNOWN)


def is_failure(code: int) -> bool:
    return code not in INFORMATIONAL
