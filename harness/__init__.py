"""The harness: `python -m harness` runs one job (or, with -m, a sweep). `core/` is the engine every run shares,
`real/` and `sim/` the two runners, `analysis/` turns records into tables, plots and reports."""
