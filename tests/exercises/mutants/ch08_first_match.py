WHAT = "prompt lookup takes the first earlier match instead of the most recent one"
CHAPTER = "08"
EDITS = [("        for start in range(len(tokens) - n - 1, -1, -1):      # most recent match first",
          "        for start in range(len(tokens) - n):")]
CHECKS = "ch08 and (worked or proposer_behaves_like)"
