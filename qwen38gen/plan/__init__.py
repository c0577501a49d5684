"""The planner: from a model and its lanes to the kernel entry points, buffers, fused weights and
launch schedules of one program. One module per kernel family (gemv, wgmma, gdn, attention,
elementwise, speculative), the schedule table as data (table), the device's facts (arch), and the
schedule builder (builder) that program.plan_program drives.
"""
