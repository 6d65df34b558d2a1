"""What this host is, read from sysfs: how many TPU chips sit on its PCI bus, and whether it is a GCE VM.

Only reads small sysfs files: never opens libtpu or a device, never touches the
network, so every answer is immediate.
"""

from __future__ import annotations

from pathlib import Path

PCI_DEVICES = Path("/sys/bus/pci/devices")
DMI_ID = Path("/sys/class/dmi/id")

#: Google's PCI vendor id (also used by Google's virtual NIC, so the device id matters).
GOOGLE_PCI_VENDOR_ID = "0x1ae0"
#: Known TPU PCI device ids: v2/v3 0x0027, v4 0x005e, v5e 0x0063, v6e 0x006f, and the
#: two more PyTorch/XLA lists (0x0056, 0x0062).
TPU_PCI_DEVICE_IDS = frozenset({"0x0027", "0x005e", "0x0056", "0x0062", "0x0063", "0x006f"})
#: PCI base class "processing accelerator": a Google device of this class is
#: counted even if its device id is newer than the list above.
ACCELERATOR_PCI_CLASS_PREFIX = "0x12"


def _read(path: Path) -> str:
    try:
        return path.read_text().strip().lower()
    except OSError:
        return ""


def count_tpu_chips(pci_devices: Path = PCI_DEVICES) -> int:
    """TPU chips attached to this host through PCI (0 off a TPU VM)."""
    try:
        devices = sorted(pci_devices.iterdir())
    except OSError:
        return 0
    chips = 0
    for device in devices:
        if _read(device / "vendor") != GOOGLE_PCI_VENDOR_ID:
            continue
        if _read(device / "device") in TPU_PCI_DEVICE_IDS or _read(device / "class").startswith(
            ACCELERATOR_PCI_CLASS_PREFIX
        ):
            chips += 1
    return chips


def on_google_compute_engine(dmi_id: Path = DMI_ID) -> bool:
    """Whether this is a GCE VM (so the metadata server at 169.254.169.254 can answer)."""
    return _read(dmi_id / "product_name") == "google compute engine" or _read(dmi_id / "bios_vendor") == "google"
