"""Former home of the recorder and its registry, now in :mod:`.recording`: the old names,
kept so that imports and configuration that name them go on working (the configuration
section ``TapManager`` is read by :class:`.recording.registry.RecorderRegistry` itself).

Imported by nothing in the package.
"""

from .recording.recorder import KernelRecorder
from .recording.registry import KERNEL_ACTIONS_SCHEMA, RecorderRegistry

__all__ = ["KERNEL_ACTIONS_SCHEMA", "KernelTap", "TapManager"]

#: The former name of :class:`.recording.recorder.KernelRecorder`.
KernelTap = KernelRecorder
#: The former name of :class:`.recording.registry.RecorderRegistry`.
TapManager = RecorderRegistry
