"""NVIDIA Xid errors that NVIDIA documents as a hardware or driver fault, and finding them
in a text (a container's termination message, a pod Event's note).

An Xid is the NVIDIA driver's report of a GPU error, logged as ``NVRM: Xid (PCI:...): 79,
...``; applications and monitoring agents repeat it in their own words (``Xid 79``,
``XID: 48``). Which Xids are the GPU's or its driver's fault comes from NVIDIA's Xid
catalogue, "Xid Errors", section "Xid Error Listing" (docs.nvidia.com/deploy/xid-errors,
the r555 revision of September 2024): for each Xid it marks the possible causes, among
them "HW Error", "Driver Error" and "User App Error". ``DEVICE_FAULT_XIDS`` holds every Xid
marked HW Error or Driver Error and *not* User App Error: where NVIDIA says the
application may be the cause (13 Graphics Engine Exception, 31 GPU memory page fault, 43
and 45, 68, 109 Context Switch Timeout, ...), the failure stays the application's. The
list was read column by column from a transcription of that table (leptonai/gpud
``components/accelerator/nvidia/xid``, which cites it row by row), since NVIDIA's page is
not machine-readable; NVIDIA's own device plugin and DRA driver treat exactly 13, 31, 43,
45, 68 and 109 as application errors (``applicationErrorXids`` in
NVIDIA/k8s-device-plugin internal/rm/health.go; ``xidsToSkip`` in
NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/device_health.go), none of which is here.
Xids the table marks with no cause at all (54, 61, 142, the reserved ones) are left out:
an admin who wants them names them in a category of their own.
"""

from __future__ import annotations

import re

DEVICE_FAULT_XIDS = frozenset(
    {
        *(1, 2, 3, 4, 6, 7, 9, 11, 12, 16, 18, 19, 20, 21, 22, 26, 27, 28, 29, 30),
        *(32, 33, 34, 35, 36, 37, 38, 42, 44, 46, 47, 48, 56, 57, 58, 59, 60, 62, 63),
        *(64, 65, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85),
        *(86, 88, 89, 92, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105),
        *(110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124),
        *(125, 140, 143),
    }
)
#: "Xid", then an optional parenthesised device (``(PCI:0000:10:1c)``), an optional ``:``
#: or ``=``, and the number: the driver's form and the usual retellings of it.
_XID = re.compile(r"\bxid\b\s*(?:\([^)\n]{0,64}\))?\s*[:=]?\s*([0-9]{1,3})\b", re.IGNORECASE)
#: Only so much of a text is searched (a termination message is at most 4096 bytes, an
#: Event's note 1024; what is searched is bounded either way).
MAX_TEXT = 16 * 1024


def xids(text: str) -> list[int]:
    """Every Xid number ``text`` names, in order."""
    return [int(m.group(1)) for m in _XID.finditer(text[:MAX_TEXT])]


def device_fault(text: str) -> int | None:
    """The first Xid in ``text`` that NVIDIA documents as a hardware or driver fault."""
    for number in xids(text):
        if number in DEVICE_FAULT_XIDS:
            return number
    return None
