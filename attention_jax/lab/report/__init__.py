"""What a finished study writes: tables, figures and the hard set's report.

`results` the decoder study's results.csv and summary.md, `outputs` which
files a study writes, `plots` its figures, `hard_report` the hard set's
table; `suite_report` the suite's results and figure, `published` the
papers' numbers beside ours.
"""
