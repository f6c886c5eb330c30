"""The GDN conformance suite: one pytest module per contract area.

Run it with ``gdn-spec check module:callable`` or ``pytest --pyargs gdn_spec.suite --gdn-impl module:callable``.
"""
