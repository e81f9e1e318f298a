"""(rules added below)"""
