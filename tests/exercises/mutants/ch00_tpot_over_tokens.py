WHAT = "TPOT divides the token span by every token instead of the gaps between them"
CHAPTER = "00"
EDITS = [("return (row.last_token - row.first_token) / (row.output_tokens - 1)",
          "return (row.last_token - row.first_token) / row.output_tokens")]
CHECKS = "ch00 and (worked or sim_traces)"
