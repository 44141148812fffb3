"""Reading run folders back: collecting runs, statistics, tables, claims, reports, figures."""
