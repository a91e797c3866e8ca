"""`popkit check`: the rule table and the static rules (server refusals, reward hacks)."""
