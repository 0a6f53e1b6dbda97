"""Adapters that put a map behind the process protocol (``docs/protocol.md``).

- :mod:`cowstate_spec.adapters.serve`: the protocol loop for any Python map;
- :mod:`cowstate_spec.adapters.cmap`: the reference adapter, cowstate's C map
  (``python -m cowstate_spec.adapters.cmap``), or any implementation the spec
  names (planted bugs too).

The Java adapter of Flink's own map is ``adapters/flink-java`` at the top of
the repository (``make flink-adapter``).
"""
