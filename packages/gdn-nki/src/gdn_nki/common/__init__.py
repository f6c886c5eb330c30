"""The NKI layer every kernel family shares: the backend (real ``nki`` or nki-cpu), tile allocation and elementwise
helpers, trace-time engine balancing, the launch lockstep and the in-kernel contract assert.

Imports nothing else of gdn-nki (``docs/architecture.md``, "gdn-nki's layers").
"""
