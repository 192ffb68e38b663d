"""Commands for readers and instructors: the terminal demo and the environment check."""
