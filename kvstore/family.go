package kvstore

// Family is the prompt family of a block: the top FamilyBits bits of the block key of its chain's block 0.
// Every block of one prompt has its prompt's family, so layout 2 of the Redis index keeps a family's blocks
// in one hash slot (`{<family>:<model>}`): one request's lookups stay in one slot, and prompts with different
// first blocks (different system prompts) spread over a Redis Cluster's masters. Ingestion knows each
// block's family from its chain (kvevents keeps it beside the block key) and passes it in Update.Families.
type Family uint16

// FamilyBits is how many bits of a chain's block 0 key make its Family (4,096 families per model).
const FamilyBits = 12

// FamilyOf returns the family of a chain whose block 0 has key root.
func FamilyOf(root BlockKey) Family { return Family(root >> (64 - FamilyBits)) }

// familyAt returns the family of u.Keys[i]: u.Families[i], or, without Families, FamilyOf(u.Keys[i]) (the
// key taken as its own chain's block 0).
func (u *Update) familyAt(i int) Family {
	if len(u.Families) == len(u.Keys) {
		return u.Families[i]
	}
	return FamilyOf(u.Keys[i])
}
