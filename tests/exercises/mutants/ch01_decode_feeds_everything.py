WHAT = "greedy_generate feeds the whole sequence again at every step instead of the newest token"
CHAPTER = "01"
EDITS = [("step_tokens = [output[-1]]", "step_tokens, num_cached = list(prompt_ids) + output, 0")]
CHECKS = "ch01 and newest_token"
