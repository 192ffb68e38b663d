WHAT = "admit_waiting forgets to move the request out of the waiting queue (the engine stalls)"
CHAPTER = "03"
EDITS = [("            self.waiting.remove(request)\n            self.running.append(request)",
          "            self.running.append(request)")]
CHECKS = "ch03 and (seed_example or real_engine)"
