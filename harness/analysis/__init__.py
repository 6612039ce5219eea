"""From records to what a reader sees: metric tables, the run summary, plots, reports, comparisons across runs,
and the atomic writes that put them on disk."""
