"""Where a run's verdicts come from: the judge factory, the reward server's wire format and client; see README.md."""
