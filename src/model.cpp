// implemented in a following commit
