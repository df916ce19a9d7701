"""What a finished study writes: tables, figures and the hard set's report.

`result_files` the decoder study's result files (results.csv's schema,
atomic reads and writes), `results` its summary.md tables, `outputs` which
files a study writes, `plots` its figures, `hard_report` the hard set's
table; `suite_report` the suite's results and figure, `published` the
papers' numbers beside ours.
"""
