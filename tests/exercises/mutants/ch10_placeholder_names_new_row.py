WHAT = ("a placeholder names the sequence's row in the new plan instead of its row in "
        "the step before")
CHAPTER = "10"
EDITS = [("        placeholders.append([-1 - row])",
          "        placeholders.append([-1 - len(following) + 1])")]
CHECKS = "ch10 and (worked or fake_model)"
