"""``explain``: the logit lens, DLA, exact patching and attention of one prediction in one call, with a report."""
