WHAT = ("plan_next forgets the tokens in flight: a sequence whose last token is in "
        "flight is planned again")
CHAPTER = "10"
EDITS = [("        if seq.finished or len(seq.output) + seq.in_flight >= seq.max_tokens:",
          "        if seq.finished or len(seq.output) >= seq.max_tokens:")]
CHECKS = "ch10 and (worked or fake_model)"
