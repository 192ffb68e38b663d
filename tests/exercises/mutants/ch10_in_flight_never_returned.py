WHAT = ("collect never takes a token out of flight: sequences look fuller than they are "
        "and stop early")
CHAPTER = "10"
EDITS = [("        seq.in_flight -= 1\n", "")]
CHECKS = "ch10 and (worked or fake_model)"
