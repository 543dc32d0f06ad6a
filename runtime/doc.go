// Package runtime holds the node-side contract: a Runtime keeps slots that move
// warm → binding → bound → releasing → warm. Implementations live in
// runtime/noderuntime (real) and runtime/fake (in memory, for scale tests).
package runtime
