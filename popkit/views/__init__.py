"""All terminal output: rich for people, JSON for agents. Nothing outside cli/ and views/ prints."""
