"""Tables and finished runs: a table file resolved into runs, tuned, run, archived and summarised; a finished
run's trained model rebuilt."""
