WHAT = "greedy acceptance trusts the proposal: every proposed token is kept without comparing"
CHAPTER = "08"
EDITS = [("        while accepted < k and proposed[accepted] == target[accepted]:",
          "        while accepted < k:")]
CHECKS = "ch08 and (worked or greedy_accept)"
