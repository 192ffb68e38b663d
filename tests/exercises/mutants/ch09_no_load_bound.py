WHAT = "no load bound: every prompt that matches goes to its replica however far ahead it is"
CHAPTER = "09"
EDITS = [("""        if (match[best] < self.threshold * len(prompt)
                or len(self.sent[best]) - len(self.sent[least]) > self.max_imbalance):""",
          """        if match[best] < self.threshold * len(prompt):""")]
CHECKS = "ch09 and (worked or load_bound)"
