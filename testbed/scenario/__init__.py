"""The scenario side: one scenario model, the dense reference, the rank program that drives
``impl`` through a scenario, the invariants checked on its record, mutants of ``impl``,
fuzz strategies, and the reports."""
