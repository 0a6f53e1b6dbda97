"""cowstate_spec: the specification of cowstate as code.

- :mod:`cowstate_spec.machine`: the Hypothesis state machine that drives an
  implementation and the reference model side by side;
- :mod:`cowstate_spec.invariants`: the structural invariant checker;
- :mod:`cowstate_spec.implementations`: every implementation the spec checks;
- :mod:`cowstate_spec.bad_implementations`: broken maps the spec must catch;
- :mod:`cowstate_spec.differential`: random workloads, implementation vs model;
- :mod:`cowstate_spec.keys`, :mod:`cowstate_spec.strategies`: test data.
"""
