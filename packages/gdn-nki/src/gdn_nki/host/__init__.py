"""The kernels on the host: numpy (and CPU torch) entry points that check the contract, stage a caller's state
all-or-nothing, pick launch grids and buckets, and record launches.

Imports the kernel families and ``gdn_nki.common``, never ``gdn_nki.torch`` (``docs/architecture.md``, "gdn-nki's
layers").
"""
