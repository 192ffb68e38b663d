WHAT = ("collect keeps the token a finished sequence computed after its stop (stops "
        "checked as if known at launch)")
CHAPTER = "10"
EDITS = [("        if seq.finished:\n            continue\n        seq.output.append(token)",
          "        seq.output.append(token)")]
CHECKS = "ch10 and (worked or fake_model or real_model)"
