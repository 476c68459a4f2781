"""nvidia-mig-parted configuration files (``api/spec/v1``): parse, render, and convert to layouts.

Schema (facts §5.1)::

    version: v1
    mig-configs:
      <config name>:
        - device-filter: ["0x20B010DE"]   # optional, string or list, "0x<DEVICE><VENDOR>"
          devices: all                    # required: "all" or a list of GPU indices
          mig-enabled: true               # required
          mig-devices: {"1g.5gb": 7}      # required when enabled ({} = none); empty when disabled

mig-parted keeps counts, not placements: ``nvidia-mig-parted apply`` recreates every instance and
lets the driver place them. :func:`migparted_to_layout` chooses placements with
:func:`fleet.mig.planning.plan_layout` instead.

Documents come from users, so their size is bounded before any work: the text length, the number
of configs, entries, devices and profiles, and each count (no GPU holds more than
:data:`MAX_COUNT` instances). YAML anchors and aliases are refused: an alias lets a short text
stand for a huge document.

The package: :mod:`.spec` (the file as values, the error), :mod:`.parse` (reading, bounded) and
:mod:`.convert` (rendering, and layouts to and from a config).
"""
