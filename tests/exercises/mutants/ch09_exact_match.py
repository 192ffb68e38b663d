WHAT = "affinity compares whole prompts instead of prefixes: a chat's next turn never matches"
CHAPTER = "09"
EDITS = [("match = [max((common_prefix_length(prompt, p) for p in prompts), default=0)",
          "match = [max((len(p) if p == prompt else 0 for p in prompts), default=0)")]
CHECKS = "ch09 and (worked or by_the_rule)"
