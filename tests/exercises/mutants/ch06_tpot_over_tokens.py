WHAT = "TPOT divides the span by the number of tokens instead of the gaps between them"
CHAPTER = "06"
EDITS = [("return (times[-1] - times[0]) / (len(times) - 1)",
          "return (times[-1] - times[0]) / len(times)")]
CHECKS = "ch06 and (worked or per_request)"
