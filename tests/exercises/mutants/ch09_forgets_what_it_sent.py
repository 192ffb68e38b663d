WHAT = "route never records the prompt, so no replica ever holds a prefix and affinity never fires"
CHAPTER = "09"
EDITS = [("        self.sent[best].append(prompt)\n", "")]
CHECKS = "ch09 and (worked or by_the_rule or real_replicas)"
